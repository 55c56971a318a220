"""`python -m worldstep.train --help`."""

from worldstep.train.loop import main

if __name__ == "__main__":
    main()
