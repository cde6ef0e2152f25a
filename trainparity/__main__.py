import sys

from trainparity._cli import main

sys.exit(main())
