"""Epoch arithmetic, pure and shared by every dataset: who reads (:class:`World`: rank, world size, worker),
which samples each (rank, worker) reads (sharding), an epoch resumed on another number of ranks (elastic),
which source each position of a mixed epoch draws from (mixing), the one resume protocol, and seeding."""
