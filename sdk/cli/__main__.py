"""``python -m conveyor.cli``: the same as the ``conveyor`` script."""

from conveyor.cli.main import main

main()
