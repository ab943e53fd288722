"""What the copies of pytorch/examples' RPC programs here use that Debian's torch 1.13 lacks or
that needs the network: torch 2.x's `torch.accelerator` (for CUDA, the only accelerator these
machines have) and `torch.compile` (here it compiles nothing), and a synthetic stand-in for
MNIST (the programs download it). Under torch 2.x only `mnist` is used."""

import torch


class _Accelerator:
    """The part of torch.accelerator (torch >= 2.6) the programs call, over torch.cuda."""

    @staticmethod
    def is_available():
        return torch.cuda.is_available()

    @staticmethod
    def current_accelerator():
        return torch.device("cuda") if torch.cuda.is_available() else None

    @staticmethod
    def device_count():
        return torch.cuda.device_count()

    @staticmethod
    def device_index(index):
        torch.cuda.set_device(index)


if not hasattr(torch, "accelerator"):
    torch.accelerator = _Accelerator()


def _compile(model=None, **options):
    """torch.compile's signature, compiling nothing: the function or module itself."""
    return model if model is not None else (lambda function: function)


if not hasattr(torch, "compile"):
    torch.compile = _compile


def mnist(samples):
    """`samples` random 1x28x28 images with labels 0..9, in place of torchvision's MNIST."""
    generator = torch.Generator().manual_seed(samples)
    images = torch.randn(samples, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    return torch.utils.data.TensorDataset(images, labels)
