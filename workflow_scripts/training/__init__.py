"""training"""
import time

# when a rank's process first imported this package, before torch and the libraries: the start of the run's first
# setup phase (training/loop.py Phases)
IMPORTED = time.time()
