import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one torch thread beats two, and by far when other work shares the cores.
    A test module opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
