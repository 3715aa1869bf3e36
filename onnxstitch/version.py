"""The package's version, in a module of its own: modules that record it (bench, check) import it
from here rather than from the package, whose __init__ imports the pipeline on first use."""
__version__ = "0.1.0"
