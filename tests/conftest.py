import os
import random

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")
# MindSpore's CPU ops run asynchronously by default; on 2 cores that is ~10x slower for small ops.
ms.runtime.launch_blocking()


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    np.random.seed(0)
    yield
