try:
    from launcher.console import main
except KeyboardInterrupt:  # Ctrl-C while the console module itself loads
    import os
    import sys

    sys.stderr.write("interrupted\n")
    os._exit(130)

main()
