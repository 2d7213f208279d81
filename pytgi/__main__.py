import sys

from pytgi.cli.main import main

sys.exit(main())
