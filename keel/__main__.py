from keel.cli import main

main()
