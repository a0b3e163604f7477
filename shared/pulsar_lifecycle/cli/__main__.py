"""`python -m pulsar_lifecycle.cli`: the same command as `pulsar-lifecycle`."""
from .main import main

if __name__ == "__main__":
    main()
