"""A partition's state directory held in a dict (name -> bytes), as the store reads one
(`store.lifecycle.sources.FileSource`): for tests of the store without Spark."""


class DictFiles:
    def __init__(self, files=None, where="ck/state/0/0", context="operator 0, partition 0"):
        self.files = {} if files is None else files
        self.where, self.context = where, context

    def names(self):
        return list(self.files)

    def read(self, name):
        return self.files[name]

    def tail(self, name, size):
        return self.files.get(name, b"")[-size:]
