"""`miniswe chat`: the interactive mode. A session is one trajectory driven by the same Agent as `run`: each
message the person types is a turn of the step loop (session.py); approval modes are a before_command hook
(approval.py); the console shows the run as it goes (console.py); the REPL reads lines and slash commands
(repl.py, editor.py); sessions are kept under the miniswe home (store.py)."""
