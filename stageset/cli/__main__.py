from stageset.cli.main import main

main()
