"""``caco_tiny_digits``: a TFDS data set prepared from a manual folder of PNG digits.

The folder holds ``train/<class>/*.png`` and ``test/<class>/*.png``; preparing it runs TFDS's
own preparation path (``download_and_prepare`` with a ``manual_dir``), writing TFRecord shards
and metadata into ``data_dir``.  A process that never imports this module reads the prepared
data set by name from that ``data_dir`` (TFDS's read-only builder).
"""

import tensorflow_datasets as tfds

CLASSES = ["zero", "one", "two"]


class CacoTinyDigits(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Test fixture."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = "manual_dir holds train/<class>/*.png and test/<class>/*.png"

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            description="A few MNIST digits as PNG files (test fixture).",
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(28, 28, 1)),
                "label": tfds.features.ClassLabel(names=CLASSES),
            }),
            supervised_keys=("image", "label"))

    def _split_generators(self, dl_manager):
        root = dl_manager.manual_dir
        return {split: self._generate_examples(root / split) for split in ("train", "test")}

    def _generate_examples(self, folder):
        for class_folder in sorted(folder.iterdir()):
            for path in sorted(class_folder.iterdir()):
                yield f"{class_folder.name}/{path.name}", {"image": path,
                                                           "label": class_folder.name}
