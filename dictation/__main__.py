from dictation.cli import main

raise SystemExit(main())
