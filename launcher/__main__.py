from launcher.console import main

main()
