from setuptools import find_packages, setup

setup(
    name="neuroshard",
    version="0.1.0",
    description="Embedding-table sharding with pre-trained neural cost models (NeuroShard, MLSys 2023)",
    packages=find_packages(include=["neuroshard", "neuroshard.*"]),
    python_requires=">=3.10",
    install_requires=["torch", "numpy", "scipy", "pandas", "tqdm"],
    extras_require={"fbgemm": ["fbgemm-gpu-cpu==1.8.0"], "plots": ["matplotlib"], "test": ["pytest"]},
)
