from sprint.cli import main

raise SystemExit(main())
