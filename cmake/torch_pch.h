// Precompiled header for translation units that use libtorch (~20 s per TU without it).
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
