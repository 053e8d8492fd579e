"""`python -m nereid` runs the command-line interface."""

from nereid.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
