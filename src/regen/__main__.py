from regen.cli import main

raise SystemExit(main())
