; Definitions and references for Java.
(class_declaration name: (identifier) @name) @definition.class
(record_declaration name: (identifier) @name) @definition.class
(interface_declaration name: (identifier) @name) @definition.interface
(enum_declaration name: (identifier) @name) @definition.enum
(annotation_type_declaration name: (identifier) @name) @definition.interface
(method_declaration name: (identifier) @name) @definition.method
(constructor_declaration name: (identifier) @name) @definition.method
(field_declaration (modifiers "static") declarator: (variable_declarator name: (identifier) @name)) @definition.constant
(method_invocation name: (identifier) @reference.call)
(object_creation_expression type: (type_identifier) @reference.type)
(import_declaration (scoped_identifier name: (identifier) @reference.import))
(superclass (type_identifier) @reference.type)
(type_list (type_identifier) @reference.type)
(type_identifier) @reference.type
