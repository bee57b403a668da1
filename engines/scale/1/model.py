import numpy as np


class Model:
    def setup(self, config):  # once per execution slot; config is the trtserve ModelSpec
        self.factor = np.float32(config.parameters.get("factor", "2"))

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"Y": inputs["X"] * self.factor}  # rows on axis 0: as many out as came in
