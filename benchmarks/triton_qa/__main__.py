from benchmarks.triton_qa.runner import main

raise SystemExit(main())
