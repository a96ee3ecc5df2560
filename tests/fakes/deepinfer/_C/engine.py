"""Stand-in for deepinfer._C.engine (pybind11, csrc/engine/pybind_output.cpp): RequestOutput's
fields are read-only attributes (`def_readonly`), each but max_num_batched_tokens with a static
`get_<field>(ptr)` accessor, and `clone(ptr)`; a "pointer" here is a key into a registry."""

FIELDS = ("request_id", "prompt_len", "token_id", "finish_reason", "finished",
          "max_num_batched_tokens", "token_logprobs", "nextn_logprobs", "sum_smaller_probs",
          "top_logprobs", "top_token_ids", "prompt_logprobs", "num_output_tokens", "draft_tok",
          "accept_tok", "confidence_score")  # fmt: skip
NO_GETTER = ("max_num_batched_tokens",)
_REGISTRY = {}


class RequestOutput:
    __slots__ = ("_values",)

    def __init__(self, **values):
        unknown = set(values) - set(FIELDS)
        if unknown:
            raise TypeError(f"unknown RequestOutput fields {sorted(unknown)}")
        object.__setattr__(self, "_values", {name: values.get(name) for name in FIELDS})

    def __setattr__(self, name, value):
        raise AttributeError(f"RequestOutput.{name} is read-only")

    def ptr(self):
        _REGISTRY[id(self)] = self
        return id(self)

    @staticmethod
    def clone(ptr):
        return RequestOutput(**_REGISTRY[ptr]._values)


def _field(name):
    return property(lambda self: self._values[name])


def _getter(name):
    return staticmethod(lambda ptr: _REGISTRY[ptr]._values[name])


for _name in FIELDS:
    setattr(RequestOutput, _name, _field(_name))
    if _name not in NO_GETTER:
        setattr(RequestOutput, f"get_{_name}", _getter(_name))
