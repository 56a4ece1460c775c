"""What the package knows of ops by name, without torch: their families (families.py: matmul,
convolution, norm, attention, loss, tensor-core ops) and the dtype an operand must have for its
op to accept it (operands.py). Read by the trace, the rules and compare alike."""
