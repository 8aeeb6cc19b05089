"""Durable checkpoints of the committed state, each replica writing 1/R of it.

A checkpoint is a torch.distributed.checkpoint (DCP) checkpoint that
``torch.distributed.checkpoint.load`` reads without fthsdp, plus fthsdp's
``checkpoint.json``: what DCP lacks, a checksum of every file, the job, the
step and the model's structure. Layout of one checkpoint::

    <dir>/<job>/step-0000001200/
        share-0-rank-0/     __0_0.distcp, .metadata, share.json   (replica 0 of R, rank 0 of its group)
        share-1-rank-0/     ...
        .metadata           DCP's, merged from every share's (written last but one)
        checkpoint.json     fthsdp's record, written last: the checkpoint is complete once it exists

Modules: ``split`` (which rows each replica writes), ``share`` (stage and
write one share), ``seal`` (merge the shares into one checkpoint, check
one), ``layout`` (names, JSON records, checksums).
"""
