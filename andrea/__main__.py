import sys

from andrea.cli import main

sys.exit(main())
