"""The derived test models load and generate (and are what we think they are)."""

from speculators.llama import Model


def test_derived_models_are_the_expected_types(default_model_path, f16_model_path, q2k_model_path):
    sizes = {p.name: p.stat().st_size for p in (default_model_path, f16_model_path, q2k_model_path)}
    # F16 is much larger than Q4_K_M, Q2_K smaller
    assert sizes[f16_model_path.name] > 1.5 * sizes[default_model_path.name]
    assert sizes[q2k_model_path.name] < sizes[default_model_path.name]
    for p in (f16_model_path, q2k_model_path):
        m = Model(str(p))
        assert m.n_vocab == 262144
        m.close()
