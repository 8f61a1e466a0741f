"""python -m dictation.cli (the same as python -m dictation)."""

from dictation.cli import main

raise SystemExit(main())
