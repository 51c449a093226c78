"""Shared pieces of the attention fixtures: a backend class around an impl (and builder) with one fault."""

from reference_impl.attention.reference import (
    ReferenceAttentionBackend,
    ReferenceAttentionImpl,
    ReferenceAttentionMetadataBuilder,
)


def make_backend(name: str, impl=ReferenceAttentionImpl, builder=ReferenceAttentionMetadataBuilder, **declares):
    """A backend named `name` (get_name) on `impl` and `builder`; `declares` overrides capability predicates
    (e.g. supports_sink=False)."""

    class Backend(ReferenceAttentionBackend):
        @staticmethod
        def get_name() -> str:
            return name

        @staticmethod
        def get_impl_cls():
            return impl

        @staticmethod
        def get_builder_cls():
            return builder

    for method, value in declares.items():
        setattr(Backend, method, classmethod(lambda cls, *a, _v=value: _v))
    return Backend


Impl = ReferenceAttentionImpl
Builder = ReferenceAttentionMetadataBuilder
