"""`python -m hvfleet ...`: the `hvfleet` command, for hosts where the console
script is not on PATH (`python -m hvfleet agent --connect ...`)."""

from hvfleet.worker.launch import main

if __name__ == "__main__":
    main()
