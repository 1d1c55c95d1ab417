from quantdrift.cli import main

raise SystemExit(main())
