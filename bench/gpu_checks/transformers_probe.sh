#!/usr/bin/env bash
# Prints the installed transformers' source that decides how ringserve must read config files
# (rope scaling functions, config-class defaults, the MoE routers' group mask, sliding-window
# rules), on the GPU machine where transformers is installed:
#   bash bench/gpu_checks/transformers_probe.sh > $OUT/transformers_probe.txt
py=${PYTHON:-/opt/torch/.venv/bin/python}
d=$($py -c "import transformers,os;print(os.path.dirname(transformers.__file__))")
echo "transformers at $d"; $py -c "import transformers;print(transformers.__version__)"
for m in qwen3_moe qwen2_moe glm4_moe gpt_oss deepseek_v3 deepseek_v2 mixtral qwen3 qwen2 mistral llama; do
  echo "=== $m config"; grep -nE "sliding|window|layer_types|partial_rotary|rope|rms_norm_eps|num_key_value_heads|n_group|topk_group|routed_scaling|norm_topk|q_lora_rank|default_theta|setdefault|__post_init__|def __init__" $d/models/$m/configuration_$m.py | head -80
done
for m in qwen3_moe qwen2_moe deepseek_v2 deepseek_v3 glm4_moe gpt_oss; do
  echo "=== $m modeling route/sliding"; grep -nE "masked_fill|norm_topk|routed_scaling|sliding|scoring|topk_method|attention_scaling|softmax_scale|mscale" $d/models/$m/modeling_$m.py | head -40
done
echo "=== rope utils"; grep -nE "def |rope_scaling|original_max|truncate|attention_factor|mscale" $d/modeling_rope_utils.py | head -120
echo "=== sources"
$py - <<'PY'
import inspect, transformers
from transformers import modeling_rope_utils as r
for name in ["_compute_yarn_parameters", "_compute_dynamic_ntk_parameters", "_compute_llama3_parameters", "dynamic_rope_update"]:
    f = getattr(r, name, None)
    print("-----", name); print(inspect.getsource(f) if f else "absent")
for cls in ["RopeParameters"]:
    pass
try:
    from transformers.configuration_utils import PreTrainedConfig as P
except Exception:
    from transformers.configuration_utils import PretrainedConfig as P
for n in ["standardize_rope_params", "convert_rope_params_to_dict"]:
    f = getattr(P, n, None) or getattr(r.RotaryEmbeddingConfigMixin if hasattr(r, "RotaryEmbeddingConfigMixin") else object, n, None)
    print("-----", n); print(inspect.getsource(f) if f else "absent")
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as d3
print("----- DeepseekV3 route"); print(inspect.getsource(d3.DeepseekV3MoE.route_tokens_to_experts) if hasattr(d3.DeepseekV3MoE, "route_tokens_to_experts") else inspect.getsource(d3.DeepseekV3TopkRouter))
from transformers.models.deepseek_v2 import modeling_deepseek_v2 as d2
print("----- DeepseekV2 moe"); print(inspect.getsource(d2.DeepseekV2Moe))
from transformers.models.qwen3_moe import configuration_qwen3_moe as q3
print("----- Qwen3MoeConfig"); print(inspect.getsource(q3.Qwen3MoeConfig)[-6000:])
from transformers.models.gpt_oss import configuration_gpt_oss as g
print("----- GptOssConfig"); print(inspect.getsource(g.GptOssConfig)[-5000:])
from transformers.models.glm4_moe import configuration_glm4_moe as gl
print("----- Glm4MoeConfig"); print(inspect.getsource(gl.Glm4MoeConfig)[-5000:])
for cfgname in ["Qwen3MoeConfig", "GptOssConfig", "Glm4MoeConfig", "DeepseekV3Config", "Qwen2MoeConfig", "MixtralConfig"]:
    c = getattr(transformers, cfgname)()
    d = c.to_dict()
    print("-----", cfgname, {k: d.get(k) for k in ["rope_parameters", "rope_theta", "partial_rotary_factor", "sliding_window", "use_sliding_window", "layer_types", "max_window_layers", "rms_norm_eps", "num_key_value_heads", "n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob", "max_position_embeddings"]})
PY
echo "=== quantizers: modules_to_not_convert rule"
grep -rn -A12 "def should_convert_module\|def get_modules_to_not_convert" "$d/quantizers" "$d/integrations" 2>/dev/null | head -80
