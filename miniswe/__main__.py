from miniswe.cli import main

main()
