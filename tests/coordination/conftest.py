import sys
from pathlib import Path

# data_cases.py (synthetic batches, expected consumer views) is shared with the torchrun jobs.
sys.path.insert(0, str(Path(__file__).parent / "jobs"))
