// Walking a graph for pyqwen's CUDA fusions (gemv-il-ggml.cu, pyqwen-deltanet.cu).
#pragma once

#include "ggml-impl.h"

// A node that computes nothing: empty, or a view of another tensor's data.
static inline bool pyqwen_node_is_noop(const ggml_tensor * t) {
    return ggml_is_empty(t) || ggml_op_is_empty(t->op);
}

// The first node at or after j that computes something (n_nodes if none).
static inline int pyqwen_next_op(const ggml_cgraph * cgraph, int j) {
    while (j < cgraph->n_nodes && pyqwen_node_is_noop(cgraph->nodes[j])) {
        ++j;
    }
    return j;
}
