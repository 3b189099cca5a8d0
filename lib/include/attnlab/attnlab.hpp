// Umbrella header: the whole public API of attnlab.
#pragma once

#include "attnlab/blas.hpp"
#include "attnlab/gradcheck.hpp"
#include "attnlab/nn/parameter.hpp"
#include "attnlab/ops/attention.hpp"
#include "attnlab/ops/softmax.hpp"
#include "attnlab/random.hpp"
#include "attnlab/tensor.hpp"
#include "attnlab/threads.hpp"
