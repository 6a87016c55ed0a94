"""Shared tiny-model fixtures for the reference tests (built once per session)."""

import pytest
import torch

from .hf_tiny import PROMPT, hf_logits, make_hf_model, ninfer_dict, spec_for


@pytest.fixture(scope="session")
def hf_model():
    return make_hf_model(seed=0)


@pytest.fixture(scope="session")
def hf_prompt_logits(hf_model):
    return hf_logits(hf_model, PROMPT)


@pytest.fixture(scope="session")
def tiny_spec(hf_model):
    return spec_for(hf_model.config, mtp=True)


@pytest.fixture(scope="session")
def tiny_tensors(hf_model):
    with torch.no_grad():
        return ninfer_dict(hf_model, mtp=True)
