"""Training: the Lightning CLI (``cli``), config composition from the YAML presets (``configs``), one variant
trained through the artifact cache (``experiment.train_variant``), the eval callback (``callbacks``) and the
training-time torchmetrics (``metrics``). The LightningModules themselves are in ``lit_domino.lit``."""
