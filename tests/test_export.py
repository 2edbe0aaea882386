"""The exported backbone: TF Serving layout, loadable without keras, same features."""

import os
import subprocess
import sys

import keras
import numpy as np

from caco_tf import backbones, export


def test_saved_model_serves_the_backbone_features(tmp_path):
    keras.utils.set_random_seed(0)
    backbone = backbones.build_backbone("small_convnet", (28, 28, 1))
    path = export.export_backbone(backbone, str(tmp_path), image_size=28, channels=1,
                                  mean=0.5, std=0.25)
    assert path == os.path.join(str(tmp_path), "backbone", "1")
    assert os.path.exists(os.path.join(path, "saved_model.pb"))
    assert os.path.isdir(os.path.join(path, "variables"))

    images = np.random.default_rng(0).integers(0, 256, size=(3, 28, 28, 1), dtype=np.uint8)
    np.save(tmp_path / "images.npy", images)
    expected = backbone((images.astype("float32") / 255.0 - 0.5) / 0.25, training=False)

    # A process that imports neither keras nor caco_tf: what a plain TF user does.  (TF 2.21
    # itself loads a few keras.src utility modules on import; the restored graph needs none.)
    script = (
        "import sys, numpy as np, tensorflow as tf\n"
        f"model = tf.saved_model.load({path!r})\n"
        "out = model.signatures['serving_default'](images=tf.constant("
        f"np.load({str(tmp_path / 'images.npy')!r})))\n"
        f"np.save({str(tmp_path / 'features.npy')!r}, out['features'].numpy())\n"
        "assert 'caco_tf' not in sys.modules\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH="")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=120, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    features = np.load(tmp_path / "features.npy")
    assert features.shape == (3, 256)
    np.testing.assert_allclose(features, np.asarray(expected), rtol=1e-5, atol=1e-5)
