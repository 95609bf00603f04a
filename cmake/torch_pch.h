// Precompiled header for translation units that use libtorch (~20 s per TU without it), compiled
// once and shared (shardtrain_torch_pch in cmake/AddMpiTest.cmake). nlohmann/json is parsed by
// most of them too (~2 s each).
#pragma once
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
