#!/usr/bin/env python3
"""Train the embedded target + DFlash drafter pair: see tools/train/pipeline.py."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train.pipeline import main  # noqa: E402

sys.exit(main())
