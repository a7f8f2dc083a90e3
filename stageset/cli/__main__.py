from stageset.cli.root import main

main()
