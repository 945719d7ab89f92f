__version__ = "0.1.0"
SUPPORTED_PYSPARK = "4.3"
