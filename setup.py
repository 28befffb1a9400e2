from setuptools import find_packages, setup

# The same pins as the Makefile (requirements.txt + constraints.txt). TorchRec (the baseline, export target
# and planner interface) is not declared: its wheel depends on the CUDA fbgemm-gpu, so the Makefile installs
# torchrec==1.9.2 with --no-deps plus its pure-Python dependencies; without it, --alg torchrec and
# NeuroShardPlanner say how to install it.
setup(
    name="neuroshard",
    version="0.1.0",
    description="Embedding-table sharding with pre-trained neural cost models (NeuroShard, MLSys 2023) "
                "and DCT communication compression",
    packages=find_packages(include=["neuroshard", "neuroshard.*"]),
    python_requires=">=3.10",
    install_requires=["torch==2.13.0", "numpy", "scipy", "pandas", "tqdm", "matplotlib", "threadpoolctl"],
    extras_require={"fbgemm": ["fbgemm-gpu-cpu==1.8.0"], "test": ["pytest"]},
)
