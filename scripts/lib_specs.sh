# Sourced by scripts/gpu_run.sh and scripts/gpu_releases.sh (bash): the libraries a GPU run takes.
#
#   lib_specs LIBDIR DEST
#
# Sets LIB_SPECS to one NAME=PATH:PREFIX per line of LIBDIR/libs.txt (what gpu_prepare.py wrote;
# blank and '#' lines skipped), PATH absolute: FILE relative to LIBDIR (or absolute) as it is, or,
# where only FILE.xz is there, unpacked into DEST. A file that is in neither form: an error line
# and exit 2. Python (${PY:-python3}) unpacks, so no xz tool is needed.
lib_specs() {
    local libdir=$1 dest=$2 line name rest file prefix src
    LIB_SPECS=()
    mkdir -p "$dest" && dest=$(cd "$dest" && pwd) || exit 2
    while IFS= read -r line; do
        [[ -z "$line" || "$line" == \#* ]] && continue
        name=${line%%=*}
        rest=${line#*=}
        file=${rest%:*}
        prefix=${rest##*:}
        src="$libdir/$file"
        [[ "$file" == /* ]] && src="$file"
        if [[ ! -f "$src" && -f "$src.xz" ]]; then
            "${PY:-python3}" -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" \
                "$src.xz" "$dest/$(basename "$file")" || exit 2
            src="$dest/$(basename "$file")"
        fi
        [[ -f "$src" ]] || { echo "error: $src (from $libdir/libs.txt) not found" >&2; exit 2; }
        LIB_SPECS+=("$name=$(cd "$(dirname "$src")" && pwd)/$(basename "$src"):$prefix")
    done < "$libdir/libs.txt"
}
