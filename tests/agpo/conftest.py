import pytest
import torch

from agpo.models import TinyModelConfig, build_tiny_qwen2


@pytest.fixture
def three_layer_model(tiny_tokenizer):
    """A fresh 3-layer Qwen2 (hidden 64), seed 0: for choosing which layers train."""
    config = TinyModelConfig(vocab_size=320, hidden_size=64, num_layers=3, intermediate_size=128)
    return build_tiny_qwen2(tiny_tokenizer, config).eval()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
