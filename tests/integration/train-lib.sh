# train-lib.sh: what the gcoll-train scripts share (sourced after lib.sh): the binary, the
# dataset, no inherited codec settings, and a skip (77) when the dataset cannot be read.
TRAIN="$top_builddir/tools/gcoll-train"
data="${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}"
unset GCOLL_COMPRESSOR GCOLL_LAYER_POLICY GCOLL_BUCKET_BYTES

if [ ! -e "$data/train-images-idx3-ubyte.gz" ] && [ ! -e "$data/train-images-idx3-ubyte" ]; then
    echo "SKIP: Fashion-MNIST not found in $data (Debian: apt-get install dataset-fashion-mnist)"
    exit 77
fi
if [ ! -e "$data/train-images-idx3-ubyte" ] && "$TRAIN" --help | grep -q 'gzip no'; then
    echo "SKIP: gcoll-train was built without zlib and $data holds only gzipped files"
    exit 77
fi
