"""The flags of each command, one module a command, named as the registry names it
(``quantdrift.cli.COMMANDS``): argparse and light helpers only, so that
``quantdrift COMMAND --help`` loads nothing heavy. What a command runs is in
``quantdrift.cli.<module>``, imported only when it runs."""
