"""Model contracts (`graphs/<model_id>.yaml`): what an artifact's objects mean.

    contract = find_contract(artifact.path, artifact.model_id, explicit=None)
    spec = contract.resolve_for(artifact)      # or contract.resolve(present=[...])
    check_artifact(artifact, spec)             # ContractError listing every problem
    spec.objects["text/layers/3/attention/query_key"].shape  -> (7168, 5120)
    spec.views[(name, "query")]                               -> RowView(...)
    spec.expert_banks[name].row(expert, "up", r)              -> stored row (MoE banks)
"""

from .check import artifact_problems, check_artifact
from .loader import (
    CONTRACT_SUFFIX,
    GRAPHS_DIR,
    attention_interval,
    dims_from_hf_config,
    find_contract,
    load_contract,
    parse_contract,
    render_contract,
    write_contract,
)
from .schema import (
    FORMAT_LAYOUTS,
    PART_NAMES,
    Contract,
    ExpectedObject,
    ExpertBank,
    ExpressionError,
    ModelSpec,
    RowView,
    ShapeExpr,
    parse_expr,
)

__all__ = [
    "CONTRACT_SUFFIX",
    "Contract",
    "ExpectedObject",
    "ExpertBank",
    "ExpressionError",
    "FORMAT_LAYOUTS",
    "GRAPHS_DIR",
    "ModelSpec",
    "PART_NAMES",
    "RowView",
    "ShapeExpr",
    "artifact_problems",
    "attention_interval",
    "check_artifact",
    "dims_from_hf_config",
    "find_contract",
    "load_contract",
    "parse_contract",
    "render_contract",
    "write_contract",
]
