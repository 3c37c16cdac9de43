from pcgopt.cli import main

raise SystemExit(main())
