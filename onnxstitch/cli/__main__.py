"""`python -m onnxstitch.cli` runs the command line."""
from .main import main

main()
