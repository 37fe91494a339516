"""Each command's --help lists every exit code the command can give, as status.py gives them."""


def test_batch_help_names_every_exit_code(cli):
    text = " ".join(cli("batch", "--help").stdout.split())
    assert ("Exit codes: 0 every task ended by the agent, 1 a batch budget stopped the batch before every task ran "
            "(run it again to run them), 2 bad input, 3 infrastructure failures, 129/130/143 interrupted.") in text
