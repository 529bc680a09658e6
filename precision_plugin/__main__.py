"""``python -m precision_plugin``: the same command line as ``precision-plugin``."""

from precision_plugin.cli import main

raise SystemExit(main())
