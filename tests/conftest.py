import os
import sys

# tests import the flat top-level modules (model.py, ckpt.py, ...) and the helpers beside them
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
