"""`python -m tests.support.apps.clock`: print this process's wall clock (time.time()), so a test
can see that `python -m keel.chaos.skewed SECONDS tests.support.apps.clock` runs ahead."""

import time

if __name__ == "__main__":
    print(repr(time.time()))
