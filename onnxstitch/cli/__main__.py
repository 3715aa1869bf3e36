"""`python -m onnxstitch.cli` runs the command line."""
from .main import main

if __name__ == "__main__":  # (not in worker processes, which import this module again: measure.py)
    main()
